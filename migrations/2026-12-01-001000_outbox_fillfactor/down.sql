ALTER TABLE compensation_events RESET (fillfactor);
