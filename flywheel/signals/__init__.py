"""Training signal compiled from feedback, tickets, repositories and task files."""
