"""Solving requests for the service, off the event loop: ``pool.py`` (solver processes),
``run.py`` (one request solved for a route), ``jobs.py`` (asynchronous solves). See the
package map in ``planner_service/service/__init__.py``."""
