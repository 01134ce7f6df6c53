"""`cronstream analytics`: windowed alerts from the public execution-events stream."""
