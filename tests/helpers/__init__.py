"""What several test modules share: record builders, scripted CLI sessions, fixture replays, Gym agents, the lanes
(``make test`` and ``make test-full``). Test modules import from here or from conftest, never from one another."""
