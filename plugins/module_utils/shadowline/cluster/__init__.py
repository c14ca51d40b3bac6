"""Tools that reach a deployment from any of its hosts, given its plan: credentials (access), the frontend's
registrations (discovery), a cohort's state on a node, readiness waits, the event history and the status table.
Used by the agent, the CLI, the modules, the drills and the Slurm job alike."""
