"""Reports over results.json: a Markdown summary, a self-contained HTML page with plots, Chrome
traces of stream timelines, and a comparison of two runs.

    results      results.json from scenario results, written atomically
    schema       the results.json layout (version 1) and `validate`
    environment  `collect_environment`: device, NVML (matched by UUID) and host details
    summary      summary.md
    html, plots  report.html and its figures (matplotlib, imported only when plotting)
    timeline     `write_chrome_trace` for Perfetto / chrome://tracing
    compare      `compare(new, baseline)`: new races, unmet expectations, cost regressions
    merge        `merge_documents`: the shards of a CI matrix (or several whole runs) as one document
    journal      the append-only journal of finished scenarios a cut-short run is rebuilt from

The `report` and `compare` subcommands are `harness.frontends.report_commands`.
"""
