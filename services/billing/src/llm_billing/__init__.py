"""The billing service: two-phase usage metering, budgets, prices and invoices."""
