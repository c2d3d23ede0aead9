"""The one-host platform supervisor behind `make up`, `make down` and `make status`."""
