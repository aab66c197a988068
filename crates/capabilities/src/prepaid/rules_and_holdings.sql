-- A store's prepaid rules and operator, and what the member holds with that operator now
-- (`prepaid_holdings`) when the rules cap anything and `$5` asks for it: what a placing
-- checks, in one read. A store without caps (or a sale that is not prepaid) costs no sum: the
-- lateral's WHERE names only the outer row, so it gates the function as a one-time filter.
--
--   $1  store id         bigint
--   $2  member id        bigint
--   $3  today            date    (business time zone)
--   $4  time zone        text
--   $5  holdings wanted  boolean
SELECT s.operator_code,
       pr.preset,
       pr.membership_max_cents,
       pr.membership_max_days,
       pr.sessions_max_cents,
       pr.sessions_max_count,
       pr.top_up_max_cents,
       pr.total_max_cents,
       pr.cooling_off_days,
       pr.refund_within_working_days,
       pr.terms_version,
       pr.terms_text,
       h.membership_cents,
       h.membership_days,
       h.sessions_cents,
       h.sessions_count,
       h.wallet_cents,
       h.total_cents
  FROM stores s
  LEFT JOIN prepaid_rules pr ON pr.store_id = s.id
  LEFT JOIN LATERAL (
        SELECT *
          FROM prepaid_holdings($2, s.operator_code, $3, $4)
         WHERE $5
           AND num_nonnulls(pr.membership_max_cents, pr.membership_max_days, pr.sessions_max_cents,
                            pr.sessions_max_count, pr.top_up_max_cents, pr.total_max_cents) > 0
       ) h ON true
 WHERE s.id = $1
