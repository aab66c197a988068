DROP TABLE read_your_writes;
