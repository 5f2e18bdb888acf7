"""The waiting-room page's files (package data): ``waiting.html`` with its
``waiting.css``, ``waiting.js`` and ``texts.json``, assembled by
:mod:`gateway.http.waiting_page`."""
