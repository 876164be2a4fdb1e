output "cluster_name" {
  description = "EKS cluster (aws eks update-kubeconfig --name ...)."
  value       = module.eks.cluster_name
}

output "bucket" {
  description = "Project bucket."
  value       = module.storage.bucket
}

output "mlflow_tracking_uri" {
  description = "In-cluster MLflow URI (port-forward svc/mlflow 5000 to reach it)."
  value       = module.mlflow.tracking_uri
}

output "ray_head_service" {
  description = "Ray head service (port-forward 8265 for dashboard and Jobs API)."
  value       = module.ray.head_service
}
