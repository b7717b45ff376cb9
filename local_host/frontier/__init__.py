"""The host's frontier: ``task_pool`` by site (sites, site_blocks), how a task is taken
and finished (tasks), and the URLFrontier gRPC service over it (service, queues,
urlfrontier/)."""
