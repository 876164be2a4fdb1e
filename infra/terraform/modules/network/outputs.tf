output "vpc_id" {
  description = "The VPC."
  value       = aws_vpc.this.id
}

output "vpc_cidr" {
  description = "The VPC's CIDR (the only source allowed to reach MLflow and the database)."
  value       = aws_vpc.this.cidr_block
}

output "private_subnet_ids" {
  description = "Private subnets for nodes, the database and internal load balancers."
  value       = aws_subnet.private[*].id
}
