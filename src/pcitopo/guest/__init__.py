"""What the guest gets: the plan, its bus budget, MMIO, P2P cliques, the rewrite and the prediction."""
