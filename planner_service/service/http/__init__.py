"""HTTP mechanics shared by the routes."""
