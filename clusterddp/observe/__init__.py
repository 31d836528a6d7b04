"""Looking at jobs that run or ran: following states and logs (follow), every rank's stack (stacks), step telemetry
(telemetry, top), the goodput ledger (goodput), the metrics the script recorded (metrics) and the report (report)."""
