"""Operations: the Prometheus metrics (one small observer per component), the
request counts, logs, the answer summary, the event loop's lag and the audit.

The components report through observer protocols of their own, which the
objects here fulfil; only the audit reads the stores, through their adapters.
"""
