output "mlflow_tracking_uri" {
  description = "In-cluster MLflow URI (port-forward svc/mlflow 5000 to reach it)."
  value       = module.mlflow.tracking_uri
}

output "ray_head_service" {
  description = "Ray head service (port-forward 8265 for the dashboard and Jobs API)."
  value       = module.ray.head_service
}

output "mlflow_admin_secret" {
  description = "Kubernetes secret with the MLflow admin credential (for promotion in the UI)."
  value       = module.mlflow.admin_secret_name
}
