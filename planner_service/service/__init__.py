"""The planner's HTTP API (FastAPI). ``main.create_app`` assembles it; routes live in
``routes/<resource>.py``."""
