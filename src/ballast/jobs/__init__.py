"""Long-running GPU jobs on serverless backends: the remote owns the execution timeout,
Ballast trusts a live answer forever and gives up only after losing contact for too long."""
