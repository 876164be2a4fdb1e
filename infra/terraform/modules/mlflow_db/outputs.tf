output "db_secret_arn" {
  description = "Secrets Manager secret with the database's username, password, host, port and name (read by the MLflow pod)."
  value       = aws_secretsmanager_secret.db.arn
}

output "db_address" {
  description = "Private address of the database."
  value       = aws_db_instance.this.address
}
