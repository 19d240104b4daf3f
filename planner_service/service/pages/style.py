"""The style sheet every service page starts from (pages carry it inline: they fetch
nothing)."""

from __future__ import annotations

BASE_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:24px 0 8px}
code{font-size:12px} table{border-collapse:collapse}
td,th{padding:2px 8px;border-bottom:1px solid #eee;text-align:left;vertical-align:middle}
th{background:#f6f6f6} td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.bar{position:relative;width:220px;height:14px;background:#f0f0f0;display:flex}
.bar>div{height:14px} .hbm{background:#76b7b2} .ddr{background:#edc948}
.legend span{display:inline-block;margin-right:12px}
.legend i{display:inline-block;width:10px;height:10px;margin-right:4px}
.note{color:#555;font-size:12px}
"""
