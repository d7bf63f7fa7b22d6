"""`cdc-sync status`: one screen on capture, broker, job and sinks, with a health verdict."""
