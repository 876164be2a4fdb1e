# MLflow tracking server: a Deployment behind a ClusterIP Service (reachable only inside the
# cluster / VPC, via kubectl port-forward for people), an encrypted private RDS PostgreSQL backend
# whose password lives in Secrets Manager, and the S3 artifact root.
resource "random_password" "db" {
  length  = 32
  special = false
}

resource "aws_secretsmanager_secret" "db" {
  name       = "${var.name}/mlflow-db"
  kms_key_id = var.kms_key_arn
  tags       = var.tags
}

resource "aws_secretsmanager_secret_version" "db" {
  secret_id     = aws_secretsmanager_secret.db.id
  secret_string = jsonencode({ username = "mlflow", password = random_password.db.result })
}

resource "aws_db_subnet_group" "this" {
  name       = "${var.name}-mlflow"
  subnet_ids = var.private_subnet_ids
  tags       = var.tags
}

resource "aws_security_group" "db" {
  name        = "${var.name}-mlflow-db"
  description = "PostgreSQL for MLflow: reachable from inside the VPC only"
  vpc_id      = var.vpc_id
  tags        = var.tags
}

resource "aws_vpc_security_group_ingress_rule" "db_from_vpc" {
  security_group_id = aws_security_group.db.id
  description       = "PostgreSQL from the cluster nodes"
  referenced_security_group_id = var.cluster_security_group_id
  from_port         = 5432
  to_port           = 5432
  ip_protocol       = "tcp"
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
  password                            = random_password.db.result
  db_subnet_group_name                = aws_db_subnet_group.this.name
  vpc_security_group_ids              = [aws_security_group.db.id]
  publicly_accessible                 = false
  storage_encrypted                   = true
  kms_key_id                          = var.kms_key_arn
  multi_az                            = var.multi_az
  backup_retention_period             = 14
  deletion_protection                 = true
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

resource "kubernetes_secret_v1" "db" {
  metadata {
    name      = "mlflow-db"
    namespace = var.namespace
  }
  data = {
    uri = "postgresql://mlflow:${random_password.db.result}@${aws_db_instance.this.address}:5432/mlflow?sslmode=require"
  }
}

resource "kubernetes_service_account_v1" "mlflow" {
  metadata {
    name        = "mlflow"
    namespace   = var.namespace
    annotations = { "eks.amazonaws.com/role-arn" = var.role_arn }
  }
}

resource "kubernetes_deployment_v1" "mlflow" {
  metadata {
    name      = "mlflow"
    namespace = var.namespace
    labels    = { app = "mlflow" }
  }
  spec {
    replicas = 1
    selector {
      match_labels = { app = "mlflow" }
    }
    template {
      metadata {
        labels = { app = "mlflow" }
      }
      spec {
        service_account_name = kubernetes_service_account_v1.mlflow.metadata[0].name
        node_selector        = { "sieve/role" = "system" }
        security_context {
          run_as_non_root = true
          run_as_user     = 1000
        }
        volume {
          name = "db-uri"
          secret {
            secret_name  = kubernetes_secret_v1.db.metadata[0].name
            default_mode = "0400"
          }
        }
        volume {
          name = "tmp"
          empty_dir {}
        }
        container {
          name              = "mlflow"
          image             = var.image
          image_pull_policy = "Always"
          # The database URI (with its password) is read from a mounted secret file, never an env var or arg in the spec.
          command = ["sh", "-c", join(" ", ["exec mlflow server --host 0.0.0.0 --port 5000",
            "--backend-store-uri \"$(cat /secrets/db/uri)\"",
            "--artifacts-destination s3://${var.bucket}/mlflow --serve-artifacts",
          "--allowed-hosts mlflow,mlflow.${var.namespace},mlflow.${var.namespace}.svc,localhost:5000,127.0.0.1:5000"])]
          volume_mount {
            name       = "db-uri"
            mount_path = "/secrets/db"
            read_only  = true
          }
          volume_mount {
            name       = "tmp"
            mount_path = "/tmp"
          }
          port {
            container_port = 5000
          }
          security_context {
            allow_privilege_escalation = false
            read_only_root_filesystem  = true
            capabilities {
              drop = ["ALL"]
            }
          }
          resources {
            requests = { cpu = "500m", memory = "1Gi" }
            limits   = { cpu = "2", memory = "4Gi" }
          }
          liveness_probe {
            http_get {
              path = "/health"
              port = 5000
            }
            period_seconds = 20
          }
          readiness_probe {
            http_get {
              path = "/health"
              port = 5000
            }
          }
        }
      }
    }
  }
}

resource "kubernetes_service_v1" "mlflow" {
  metadata {
    name      = "mlflow"
    namespace = var.namespace
  }
  spec {
    type     = "ClusterIP"
    selector = { app = "mlflow" }
    port {
      port        = 5000
      target_port = 5000
    }
  }
}
