"""Looking at jobs that run or ran: following states and logs (follow) and every rank's stack (stacks)."""
