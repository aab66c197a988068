DROP TABLE task_runs;
