"""shardplan's execution runtime: applies a plan with FBGEMM's table-batched embedding
kernels and torch.distributed. Everything that needs torch lives here."""
