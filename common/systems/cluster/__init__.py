"""Cluster arithmetic (labs 09-10): rack and network topology (`topology`), the arithmetic of scale and cost
(`scaling`).
"""
