"""The host's own crawler: takes tasks, fetches them politely (fetch), reads their links
(links) and records what each task came to (records); settings: what it is told."""
