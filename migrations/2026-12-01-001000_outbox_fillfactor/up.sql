-- Room on each page of the outbox for a claim's new row version, so that claiming an event
-- (which changes only its lease columns, none indexed) is a HOT update: no new entry in any of
-- the table's indexes. Pages written from now on keep 30 % free.
ALTER TABLE compensation_events SET (fillfactor = 70);
