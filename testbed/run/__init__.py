"""A run from the runner's side: bring-up, the timeline of events, live control, link checks, teardown."""
