# MLflow's database: an encrypted private RDS PostgreSQL reachable only from the cluster's security
# group. The password is generated as an ephemeral value and written only to write-only attributes
# (RDS and a Secrets Manager secret), so it never lands in Terraform state; the MLflow pod reads
# the secret at start through its IRSA role. Rotate with db_password_version.
ephemeral "aws_secretsmanager_random_password" "db" {
  password_length     = 40
  exclude_punctuation = true
}

resource "aws_secretsmanager_secret" "db" {
  name       = "${var.name}/mlflow-db"
  kms_key_id = var.kms_key_arn
  tags       = var.tags
}

resource "aws_secretsmanager_secret_version" "db" {
  secret_id = aws_secretsmanager_secret.db.id
  secret_string_wo = jsonencode({
    username = "mlflow"
    password = ephemeral.aws_secretsmanager_random_password.db.random_password
    host     = aws_db_instance.this.address
    port     = aws_db_instance.this.port
    dbname   = "mlflow"
  })
  secret_string_wo_version = var.db_password_version
}

resource "aws_db_subnet_group" "this" {
  name       = "${var.name}-mlflow"
  subnet_ids = var.private_subnet_ids
  tags       = var.tags
}

resource "aws_security_group" "db" {
  name        = "${var.name}-mlflow-db"
  description = "PostgreSQL for MLflow: reachable from the cluster security group only"
  vpc_id      = var.vpc_id
  tags        = var.tags
}

resource "aws_vpc_security_group_ingress_rule" "db_from_cluster" {
  security_group_id            = aws_security_group.db.id
  description                  = "PostgreSQL from the cluster nodes"
  referenced_security_group_id = var.cluster_security_group_id
  from_port                    = 5432
  to_port                      = 5432
  ip_protocol                  = "tcp"
}

resource "aws_db_instance" "this" {
  identifier                          = "${var.name}-mlflow"
  engine                              = "postgres"
  engine_version                      = var.postgres_version
  instance_class                      = var.db_instance_class
  allocated_storage                   = 20
  max_allocated_storage               = 200
  db_name                             = "mlflow"
  username                            = "mlflow"
  password_wo                         = ephemeral.aws_secretsmanager_random_password.db.random_password
  password_wo_version                 = var.db_password_version
  db_subnet_group_name                = aws_db_subnet_group.this.name
  vpc_security_group_ids              = [aws_security_group.db.id]
  publicly_accessible                 = false
  storage_encrypted                   = true
  kms_key_id                          = var.kms_key_arn
  multi_az                            = var.multi_az
  backup_retention_period             = 14
  deletion_protection                 = var.deletion_protection
  skip_final_snapshot                 = false
  final_snapshot_identifier           = "${var.name}-mlflow-final"
  copy_tags_to_snapshot               = true
  iam_database_authentication_enabled = true
  auto_minor_version_upgrade          = true
  performance_insights_enabled        = true
  performance_insights_kms_key_id     = var.kms_key_arn
  enabled_cloudwatch_logs_exports     = ["postgresql", "upgrade"]
  parameter_group_name                = aws_db_parameter_group.this.name
  monitoring_interval                 = 60
  monitoring_role_arn                 = aws_iam_role.rds_monitoring.arn
  tags                                = var.tags
}

resource "aws_db_parameter_group" "this" {
  name   = "${var.name}-mlflow-pg16"
  family = "postgres16"
  parameter {
    name  = "log_statement"
    value = "ddl"
  }
  parameter {
    name  = "log_min_duration_statement"
    value = "1000"
  }
  parameter {
    name         = "rds.force_ssl"
    value        = "1"
    apply_method = "pending-reboot"
  }
  tags = var.tags
}

resource "aws_iam_role" "rds_monitoring" {
  name = "${var.name}-rds-monitoring"
  assume_role_policy = jsonencode({
    Version   = "2012-10-17"
    Statement = [{ Effect = "Allow", Principal = { Service = "monitoring.rds.amazonaws.com" }, Action = "sts:AssumeRole" }]
  })
  tags = var.tags
}

resource "aws_iam_role_policy_attachment" "rds_monitoring" {
  role       = aws_iam_role.rds_monitoring.name
  policy_arn = "arn:aws:iam::aws:policy/service-role/AmazonRDSEnhancedMonitoringRole"
}

# The MLflow server's IRSA role may read this one secret (and decrypt it), nothing else.
resource "aws_iam_role_policy" "read_db_secret" {
  role = var.reader_role_name
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [
      { Effect = "Allow", Action = ["secretsmanager:GetSecretValue"], Resource = aws_secretsmanager_secret.db.arn },
      { Effect = "Allow", Action = ["kms:Decrypt"], Resource = var.kms_key_arn }
    ]
  })
}
