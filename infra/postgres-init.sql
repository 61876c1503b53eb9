-- One Postgres for the team: a database for the Prefect server, one for MLflow's tracking store.
CREATE DATABASE prefect;
CREATE DATABASE mlflow;
