"""Tests of the Slurm tooling: library units on loopback, and the real Slurm cluster of testbed instance 3."""
