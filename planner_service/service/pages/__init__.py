"""The service's HTML pages for people: a plan (``plan.py``, with what it answers at a
glance computed in ``glance.py``) and an async solve (``job.py``). Server-rendered, no
scripts, nothing fetched, no front-end build."""
