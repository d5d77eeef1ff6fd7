"""Views of report.json.

    analysis.py  what the numbers say: Pareto fronts, runtime warnings, latency lookups
    render.py    report.md, report.html and pareto.png
"""
