-- A canceled coach slot is settled once no order booked on it is still waiting, paid or in
-- use: each was canceled, refunded, or had been consumed. Conditional, so that two settlings
-- (the request and the resuming task) set it once, and never while a booking is open.
--
--   $1  coach slot id   bigint
UPDATE coach_slots s SET cancel_settled_at = now()
 WHERE s.id = $1 AND s.canceled_at IS NOT NULL AND s.cancel_settled_at IS NULL
   AND NOT EXISTS (SELECT 1 FROM orders o
                    WHERE o.coach_slot_id = s.id AND o.status IN ('WAIT_PAY', 'PAID', 'CONSUMING'))
