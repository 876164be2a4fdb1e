"""What a finished job hands its user, computed without Ray: the leaderboard and its intervals, the sweep's
report and closing verdict, the model card and the gated registration."""
