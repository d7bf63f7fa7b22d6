"""Debezium's placeholder for an unchanged TOAST value (REPLICA IDENTITY DEFAULT updates)."""

UNAVAILABLE_VALUE = "__debezium_unavailable_value"
