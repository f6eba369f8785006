"""Helpers the tests share (imported, not collected: no test lives here)."""
