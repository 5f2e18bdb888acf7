"""The waiting-room page's files (package data): ``waiting.html`` with its
``waiting.css``, ``waiting.js`` and one file of texts per language
(``texts/en.json``, ``texts/zh-Hans.json``: the same keys), assembled by
:mod:`gateway.http.waiting_page`."""
