DROP TABLE compensation_replays;
