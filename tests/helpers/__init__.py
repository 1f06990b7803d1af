"""Helpers shared by the tests (tables, media folders, tiny Lightning pieces, ddp callbacks, float
tolerances). Tests import them from here, never from each other: ``from helpers.tables import make_table``.
"""
