"""The model-agnostic serving engine: requests, scheduler, paged KV blocks, executors, clients."""
