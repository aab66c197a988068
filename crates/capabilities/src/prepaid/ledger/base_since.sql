), base AS (
    -- The closing balance of the day before the range (`prepaid_ledger_days`).
    SELECT $5::bigint AS cents
)
