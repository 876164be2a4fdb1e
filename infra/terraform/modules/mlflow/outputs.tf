output "tracking_uri" {
  description = "In-cluster MLflow tracking URI (ClusterIP service)."
  value       = "http://mlflow.${var.namespace}.svc:5000"
}

output "db_secret_arn" {
  description = "Secrets Manager secret holding the database credentials."
  value       = aws_secretsmanager_secret.db.arn
}
