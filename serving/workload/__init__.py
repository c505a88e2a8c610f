"""Workload traces: readers, writers, synthetic generation, statistics.

Import from the modules (this package stays light, so users of ``trace`` don't load pandas/pyarrow):

- ``serving.workload.trace``: ``Trace``, ``Request``, ``concat_traces``
- ``serving.workload.readers``: ``read_trace``, ``iter_trace_chunks``, ``detect_format``
- ``serving.workload.writers``: ``write_trace``
- ``serving.workload.synthetic``: ``SyntheticParams``, ``LengthDist``, ``generate``
- ``serving.workload.stats``: ``trace_stats``, ``TraceStats``, ``StatsAccumulator``
- ``serving.workload.errors``: ``TraceError``, ``TraceWarning``
- ``serving.workload.cli``: ``trace_app`` (``pdscale trace``)
"""
