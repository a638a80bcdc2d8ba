"""Cluster arithmetic (labs 09-10): rack and network topology (`topology`), where a job's ranks run and what crosses
between NVLink domains (`placement`), the arithmetic of scale and cost (`scaling`), a training run's cost model
(`cost`).
"""
