"""The offline tools: the ``av-core`` command line and what it runs, none of which a serving
engine imports.

- :mod:`~av_core.tools.cli`: the command line (``av-core``, ``python -m av_core``), with
  :mod:`~av_core.tools.argtypes` (options checked while parsed), :mod:`~av_core.tools.tables`
  (text, Markdown and JSON output) and :mod:`~av_core.tools.progress` (progress bars).
- :mod:`~av_core.tools.trace`: the labeled draft-trace format (also ``av_core.trace``), and
  :mod:`~av_core.tools.collect`, which collects one by real speculative sampling.
- :mod:`~av_core.tools.metrics`: calibration and ranking scores (also ``av_core.metrics``).
- :mod:`~av_core.tools.evaluate`: prequential evaluation of the estimator on a trace.
- :mod:`~av_core.tools.simulate`: the serving simulation, with :mod:`~av_core.tools.peers` (the
  other engines' policies) and :mod:`~av_core.tools.profile` (measured cost files).
- :mod:`~av_core.tools.plots` (matplotlib figures) and :mod:`~av_core.tools.synthetic` (synthetic
  workloads with a known law, for studies and tests).

Importing :mod:`av_core` imports none of them.
"""
