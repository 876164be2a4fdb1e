output "tracking_uri" {
  description = "In-cluster MLflow tracking URI (ClusterIP service)."
  value       = "http://mlflow.${var.namespace}.svc:${local.port}"
}

output "allowed_hosts" {
  description = "Host headers the server accepts."
  value       = local.allowed_hosts
}

output "jobs_secret_name" {
  description = "Kubernetes secret with the jobs' MLflow credential (username, password)."
  value       = kubernetes_secret_v1.jobs.metadata[0].name
}

output "admin_secret_name" {
  description = "Kubernetes secret with the MLflow admin credential (for people promoting models)."
  value       = kubernetes_secret_v1.admin.metadata[0].name
}
