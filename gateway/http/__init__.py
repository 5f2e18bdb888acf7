"""The HTTP edge: the listener's limits, routes and thin handlers, the one
middleware, request bodies, admin tokens and the waiting-room page.

It calls the use cases it is handed (through ``app[KEY]``) and reads the
operations layer's metrics; nothing below imports it.
"""
