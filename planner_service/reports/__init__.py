"""Text, markdown and JSON documents rendered from planner results, for the CLI and the
service: one module per thing rendered.

- ``tables``: text and markdown tables and the cells they share (rank lists, usage).
- ``options``: ``shardplan options``, its JSON document and its text tables.
- ``plan_table``: ``shardplan plan --format table``, the per-rank stats of a plan.
- ``diff``: ``shardplan diff``, two plans compared.
- ``migration``: ``shardplan migrate``, the bytes that move between two plans.
- ``check``: ``shardplan check``'s report (``plan/api.py``'s ``CheckReport``, computed by
  ``planner_service/check``) as text or markdown.
- ``what_if``: ``shardplan check``'s what-if answers (a sweep, the least world sizes) as
  tables.

Every place a plan is shown (``shardplan plan --format table``, ``options --format
table``, ``diff``, the plan page) prints it the same way: bytes in the binary unit that
shows the number (``plan.units.size``: "512 B", "1.00 MiB", "80.00 GiB"), shares in
percent of the rank's *usable* capacity (after the reservation), every perf component
with the rule that sums them into ``perf.total`` (``plan_table.perf_rule``), and tables in
natural order (``plan.order``: ``t2`` before ``t10``). Nothing here computes a result:
that is the stages' work, and the capacity check's (``planner_service/check``).
"""
