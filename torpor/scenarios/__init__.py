"""Scenario files for `torpor local run`, shipped as package data."""
