-- Run once by the mysql image when its data directory is created (docker-compose.yml):
-- the grants outboxd needs to read the binlog as a replica.
GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO 'outboxd'@'%';
