"""Output built from a decoded state, never printed during a walk: tables (rich) and JSON documents."""
