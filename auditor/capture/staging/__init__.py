"""Staging code you cannot edit: callables, scripts run as python runs them, spawned ranks."""
