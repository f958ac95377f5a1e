"""Helpers the test files share (spec files import them from here, not from each other)."""
