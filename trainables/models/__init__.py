"""Model families. Every model is a *bundle* of K independent replicas (K=1 is plain)."""
